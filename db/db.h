/* db.h - trainyardd's state in SQLite: jobs, attempts, ranks, metrics and
 * events, schema versions applied in order (PRAGMA user_version).
 *
 * One connection, guarded by a mutex, serves every thread. Every change of a
 * job's state goes through db_job_transition(), which writes the new state
 * and its event (with the reason) in one transaction. Values read from
 * SQLite are copied before a statement is reset; every struct or JSON value
 * returned is the caller's. */
#ifndef TY_DB_DB_H
#define TY_DB_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api/report_wire.h"

#include "common/errors.h"

typedef struct db db_t;

/* Job states, in the order of DESIGN.md's "Progress". */
#define DB_JOB_STATES(X) \
  X(QUEUED, "queued") X(STARTING, "starting") X(RUNNING, "running") \
  X(SUCCEEDED, "succeeded") X(FAILED, "failed") X(CANCELLED, "cancelled")
typedef enum {
#define TY_X(id, name) DB_JOB_##id,
  DB_JOB_STATES(TY_X)
#undef TY_X
  DB_JOB_STATE_COUNT
} db_job_state_t;
#define DB_MASK(st) (1u << (st))
#define DB_MASK_ACTIVE (DB_MASK(DB_JOB_STARTING) | DB_MASK(DB_JOB_RUNNING))
#define DB_MASK_FINAL \
  (DB_MASK(DB_JOB_SUCCEEDED) | DB_MASK(DB_JOB_FAILED) | DB_MASK(DB_JOB_CANCELLED))

/* "queued", ...; NULL for a value out of range. */
const char *db_state_name(int state);
/* The state for a name, or -1. */
int db_state_parse(const char *name);
bool db_state_final(int state);

#define DB_ID_MAX 40
#define DB_TOKEN_MAX 72

/* One job row. Strings without a size are heap copies owned by the struct
 * (freed by db_job_free); reason and spec are never NULL once read. */
typedef struct {
  int64_t seq;                 /* insertion order; pages and FIFO follow it */
  char id[DB_ID_MAX];
  char *name;
  int state;                   /* db_job_state_t */
  char *reason;                /* why the job is in its state */
  char *spec;                  /* normalized spec JSON (jobspec_to_json) */
  char *idempotency_key;       /* NULL when the submit carried none */
  char token[DB_TOKEN_MAX];    /* the per-job token of the internal endpoints */
  int world_size;
  char device[8];              /* "cpu" or "cuda", resolved at submit */
  int max_restarts;
  int attempt;                 /* attempts started so far (0 while first queued) */
  char *output_dir;            /* the spec's output_dir resolved (jobspec_resolve_path);
                                  "" for jobs stored before it was kept */
  double created_at, updated_at, started_at, finished_at; /* unix seconds; 0 unset */
} db_job_t;

void db_job_free(db_job_t *j);
void db_jobs_free(db_job_t **jobs, size_t n);

/* Opens (creating when missing, with its parent directory) and migrates the
 * database at path, for this open alone until db_close: an exclusive flock
 * on the database file itself, so that a second open (another trainyardd)
 * by any name of the file (symlink, hard link) fails with TY_EPRECONDITION,
 * naming the holder's pid (also written to "<path>-owner"), and touches
 * nothing. A database that PRAGMA quick_check finds damaged is
 * TY_EDATALOSS, naming the damage. On failure returns a TY_E* code and,
 * when msg is not NULL, a description in msg (msgsz bytes). */
int db_open(const char *path, db_t **out, char *msg, size_t msgsz);
void db_close(db_t *db);
/* Whether the name the database was opened by still reaches the file this
 * open holds (device and inode): 0, or TY_EDATALOSS with the reason in msg
 * when the file was deleted or another file put in its place, so that what
 * is written no longer lands where a restart would look. */
int db_file_check(db_t *db, char *msg, size_t msgsz);
/* The last SQLite error ("message (code)"; cleared once a later write
 * commits), or "no error recorded". */
void db_last_error(db_t *db, char *buf, size_t size);
/* The schema version this build applies (the last migration). */
int db_schema_version(void);

/* Inserts a new job in state queued, with its "submitted" event, in one
 * transaction. j->id, name, spec, token, world_size, device, max_restarts,
 * output_dir and (optionally) idempotency_key are read; seq and the times
 * are filled. When idempotency_key is already used, nothing is written and
 * TY_EEXISTS is returned with the existing job in *existing (the caller's).
 * Otherwise, when a job that has not finished (queued, starting or running)
 * has the same non-empty output_dir, nothing is written and
 * TY_EPRECONDITION is returned with that job in *existing: two jobs in one
 * folder would overwrite each other's checkpoints and outputs. */
int db_job_insert(db_t *db, db_job_t *j, db_job_t **existing);

/* The oldest job that has not finished (queued, starting or running) whose
 * output_dir is output_dir: 0 with it in *out (the caller's), TY_ENOTFOUND
 * when there is none. */
int db_job_output_user(db_t *db, const char *output_dir, db_job_t **out);

/* TY_ENOTFOUND when no job has that id. */
int db_job_get(db_t *db, const char *id, db_job_t **out);

/* The few columns a report is checked against (cheaper than db_job_get). */
typedef struct {
  int state, attempt, world_size;
  char token[DB_TOKEN_MAX];
} db_job_brief_t;
int db_job_brief(db_t *db, const char *id, db_job_brief_t *out);

/* Deletes a finished job with everything stored about it (attempts, ranks,
 * metrics, events; its Idempotency-Key becomes free), in one transaction.
 * *out receives the job as it was (the caller's), also on TY_EPRECONDITION
 * (the job has not finished: nothing is deleted) and TY_EUNAVAILABLE (it
 * has finished but a rank's end is not recorded yet, as while a cancelled
 * job's ranks stop: try again). TY_ENOTFOUND when no job has that id. */
int db_job_delete(db_t *db, const char *id, db_job_t **out);

/* Jobs whose state is in state_mask (0: every state), newest first, with
 * seq < before_seq (0: from the newest), at most limit. *out is an array of
 * *n jobs, freed with db_jobs_free. */
int db_job_list(db_t *db, unsigned state_mask, int64_t before_seq, int limit, db_job_t ***out,
                size_t *n);
/* The same, oldest first (the scheduler's FIFO order), seq > after_seq. */
int db_job_list_fifo(db_t *db, unsigned state_mask, int64_t after_seq, int limit,
                     db_job_t ***out, size_t *n);

/* Counts per state (counts has DB_JOB_STATE_COUNT entries). */
int db_job_count_by_state(db_t *db, int64_t *counts);

/* THE state change. In one transaction: checks that the job's current state
 * is in from_mask (TY_EPRECONDITION with the current state in *cur
 * otherwise; TY_ENOTFOUND for an unknown job), writes the new state and
 * reason, and appends a "state" event {from, to, reason, attempt}.
 * Entering starting opens a new attempt (attempt + 1) with world_size rank
 * rows; leaving starting or running closes the open attempt with the same
 * reason. *cur (optional) receives the state found; *attempt (optional) the
 * job's attempt number after the change. */
int db_job_transition(db_t *db, const char *id, unsigned from_mask, int to, const char *reason,
                      int *cur, int *attempt);

/* Rank bookkeeping of the open attempt. pid_start is the process start time
 * (clock ticks since boot, /proc/<pid>/stat field 22): with the pid it names
 * the process even after a restart of the server. */
int db_rank_spawned(db_t *db, const char *id, int attempt, int rank, int pid, int64_t pid_start,
                    const char *log_path);
/* state is "exited" (status 0), "failed" or "stopped"; message says why.
 * Appends a "rank" event. */
int db_rank_finished(db_t *db, const char *id, int attempt, int rank, const char *state,
                     int exit_code, const char *message);

/* One progress report of a rank (DESIGN.md "Worker contract"). */
typedef struct {
  int attempt, rank, world_size;
  char phase[16];
  int64_t step, total_steps;
  double loss;                 /* NaN when not yet known */
  double tokens_per_s;
  int64_t bytes_loaded, bytes_total, host_peak_bytes, device_peak_bytes;
  double load_seconds;
  /* train.objective dpo, phase training (has_dpo): the step's metrics
   * (api/report_wire.h's REPORT_DPO_METRICS), NaN when unknown; kept with
   * the step's metrics point. */
  bool has_dpo;
  double dpo[REPORT_DPO_N];
  char message[512];
  /* A report carrying a sample (train.sample_prompts): prompt non-empty;
   * db_report_ingest appends a "sample" event {attempt, rank, step,
   * prompt, text}. */
  char sample_prompt[1024];
  char sample_text[4096];
  /* The job's figures once this report is in (server/progress.h), which
   * its "progress" event carries as job_progress, job_progress_phase,
   * job_eta_seconds (null when NaN) and job_tokens_per_s; only when
   * has_job_progress. */
  bool has_job_progress;
  double job_progress, job_eta_seconds, job_tokens_per_s;
  char job_progress_phase[16];
} db_report_t;

/* Writes a report into the rank's row; appends a metrics point when the
 * step of a training report is new, a "progress" event when the phase
 * or the step changed (a plain heartbeat appends nothing), and a "sample"
 * event for a report that carries one (*progressed is then true too). TY_ENOTFOUND when
 * the attempt or rank does not exist; TY_EPRECONDITION when the rank has
 * already finished. *progressed (optional) tells whether an event was
 * written. */
int db_report_ingest(db_t *db, const char *id, const db_report_t *r, bool *progressed);
/* Reports are committed in groups (every few milliseconds, or before any
 * other write): a crash can lose the last few milliseconds of reports,
 * never a state change. db_flush commits what is pending now; trainyardd
 * calls it on every scheduler tick (100 ms) and db_close does too. A batch
 * that cannot be committed (disk full, I/O error, the file deleted) is
 * kept in memory (at most DBI_KEPT_MAX reports; past that a report is
 * refused with TY_EUNAVAILABLE and its rank keeps it) and written, in
 * order, before any other write once the database takes writes:
 * db_report_ingest answers 0 for a report it keeps. */
int db_flush(db_t *db);

/* Whether writes are failing now: a write failed for the disk or the file
 * (full, I/O error, read-only, the file deleted or replaced) and none has
 * committed since, or progress reports are kept waiting to be written;
 * why (size bytes, may be NULL) says so, naming SQLite's error. db_flush
 * retries what is kept and, once nothing is, probes with a small write
 * (at most every second) so that this clears within a second or two of
 * the disk taking writes again. */
bool db_write_failing(db_t *db, char *why, size_t size);
/* Progress reports kept in memory, waiting to be written. */
size_t db_kept_reports(db_t *db);
/* For tests: whether a transaction is open other than a report batch
 * (after any db_* call returns, none must be). */
bool db_in_transaction(db_t *db);

/* Sets a job's reason without a change of state (what is true of the job
 * now, as its ranks' phases change), when its state is in state_mask:
 * TY_EPRECONDITION otherwise, TY_ENOTFOUND for an unknown job. */
int db_job_set_reason(db_t *db, const char *id, unsigned state_mask, const char *reason);

/* How many started ranks of the job's newest attempt have not finished yet
 * (their end is still to be recorded). */
int db_job_unfinished_ranks(db_t *db, const char *id, int *n);

/* For recovery: calls fn once per rank row without a finish, of any job
 * (a cancelled or failed one whose ranks were still stopping included) and
 * any attempt, with its pid and pid_start (0 when never started). */
typedef void (*db_live_rank_fn)(const char *id, int attempt, int rank, int pid,
                                int64_t pid_start, void *ctx);
int db_live_ranks_each(db_t *db, db_live_rank_fn fn, void *ctx);
/* For recovery: closes (as failed, with reason) every attempt left open
 * that is not the open attempt of a job in starting or running; *n
 * receives how many. */
int db_attempts_close_stale(db_t *db, const char *reason, int *n);

/* An attempt whose ranks stopped on SIGTERM with a checkpoint: its state
 * becomes 'preempted' (after the transition that closed it). */
int db_attempt_set_preempted(db_t *db, const char *id, int attempt);
/* How many of job id's attempts were preempted: they do not count against
 * its max_restarts. */
int db_job_preemptions(db_t *db, const char *id, int *n);

/* JSON views (new objects, the caller's). */
/* {"job_id","attempt","ranks":[{rank, state, phase, step, ...}]}: the
 * given attempt, or the newest when attempt <= 0. */
int db_ranks_json(db_t *db, const char *id, int attempt, json_t **out);
/* {"job_id","attempt","ranks":[{"rank", "steps":[..], "loss":[..],
 * "tokens_per_s":[..], "t":[..]}]} */
int db_metrics_json(db_t *db, const char *id, int attempt, json_t **out);
/* Events of job id with seq > after_seq, oldest first, at most limit: an
 * array of {"seq","job_id","t","type","data"}. *last_seq receives the seq
 * of the last one (after_seq when none). */
int db_events_json(db_t *db, const char *id, int64_t after_seq, int limit, json_t **out,
                   int64_t *last_seq);
/* The log file of a rank of an attempt (newest when attempt <= 0), as a
 * new string. */
int db_rank_log_path(db_t *db, const char *id, int attempt, int rank, char **out);

/* Seconds since the epoch, with sub-second precision. */
double db_now(void);

#endif
