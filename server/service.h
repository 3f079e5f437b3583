/* service.h - trainyardd's service layer: the only place that changes job
 * state. REST (server/rest.c) and gRPC call these functions and hold no
 * logic of their own; the scheduler reports what its processes did through
 * svc_transition and the rank functions.
 *
 * Conventions: functions return 0 or a negative TY_E* code; msg (msgsz
 * bytes, may be NULL) receives a sentence for the error model's "message";
 * errs (may be NULL) receives field details. Returned jobs and JSON values
 * are the caller's. */
#ifndef TY_SERVER_SERVICE_H
#define TY_SERVER_SERVICE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/errors.h"
#include "api/jobspec.h"
#include "db/db.h"
#include "server/config.h"

typedef struct svc svc_t;
typedef struct sched sched_t;

/* Opens the database named by cfg (borrowed; it must outlive the service). */
int svc_open(const srv_config_t *cfg, svc_t **out, char *msg, size_t msgsz);
void svc_close(svc_t *s);
/* The scheduler that starts and stops ranks (borrowed). Until one is set,
 * submits are stored and stay queued. */
void svc_set_scheduler(svc_t *s, sched_t *sched);
db_t *svc_db(svc_t *s);
const srv_config_t *svc_config(svc_t *s);

/* Every rule a submit checks, without storing anything: the spec's own
 * rules with filesystem checks, the roots, the devices, whether the job
 * could ever fit this server's slots, and that no job that has not
 * finished writes the same output folder (field output_dir). Relative
 * paths in spec are made absolute (against the server's working
 * directory). */
int svc_validate(svc_t *s, jobspec_t *spec, ty_errlist_t *errs, char *msg, size_t msgsz);

/* Validates and stores a job in state queued. idempotency_key (NULL or "")
 * makes the submit repeatable: the same key with the same spec returns the
 * job stored first (*created = false), even while it runs; with a different
 * spec TY_EEXISTS. The output folder check is made as the job is stored,
 * so of two submits racing for one folder only one is stored (TY_EINVAL,
 * field output_dir, for the other). */
#define SVC_IDEMPOTENCY_KEY_MAX 128 /* as api/openapi.yaml says */
int svc_submit(svc_t *s, jobspec_t *spec, const char *idempotency_key, db_job_t **out,
               bool *created, ty_errlist_t *errs, char *msg, size_t msgsz);

int svc_get(svc_t *s, const char *id, db_job_t **out, char *msg, size_t msgsz);
/* The job's API view (svc_job_json) as compact JSON text with a newline,
 * *len bytes, a new string; served from a cache that every state change
 * of the job invalidates. */
int svc_get_text(svc_t *s, const char *id, char **text, size_t *len, char *msg, size_t msgsz);

/* A page of jobs, newest first. states: comma-separated state names (NULL
 * or "": every state). page_size: 0 for the default (50), at most
 * cfg->page_max. page_token: NULL/"" for the first page, else a
 * next_page_token returned before. *next_token is NULL on the last page,
 * else a new string (the caller's). */
int svc_list(svc_t *s, const char *states, int64_t page_size, const char *page_token,
             db_job_t ***out, size_t *n, char **next_token, ty_errlist_t *errs, char *msg,
             size_t msgsz);

/* Cancels a queued or running job: queued ones are final at once; running
 * ones are final too, and their ranks are stopped (SIGTERM, then SIGKILL
 * after the grace period), freeing their slots. The job's reason is
 * "cancelled by a client", followed by ": <reason>" when the client gave
 * one (NULL or "": none); a reason over SVC_CANCEL_REASON_MAX bytes is
 * TY_EINVAL with an error on field "reason", and changes nothing.
 * Cancelling a cancelled job is a no-op; a job that already succeeded or
 * failed gives TY_EPRECONDITION. *out (optional) receives the job after
 * the change. */
#define SVC_CANCEL_REASON_MAX 1024 /* as api/openapi.yaml says */
int svc_cancel(svc_t *s, const char *id, const char *reason, db_job_t **out, ty_errlist_t *errs,
               char *msg, size_t msgsz);

/* Deletes a job that has ended (succeeded, failed or cancelled): its rows
 * (attempts, ranks, metrics, events; its Idempotency-Key becomes free) and
 * the files the server keeps for it under state_dir/jobs/<id> (spec, rank
 * logs). Its output_dir, the user's results, is never touched. A queued or
 * running job is TY_EPRECONDITION (cancel it first); one whose ranks are
 * still being stopped is TY_EUNAVAILABLE (try again after the grace
 * period); neither changes anything. *out (optional) receives the job as it
 * was. */
int svc_delete(svc_t *s, const char *id, db_job_t **out, char *msg, size_t msgsz);

/* A rank's progress report (DESIGN.md "Worker contract"), authorized by the
 * job's own token. TY_EUNAUTHENTICATED for a wrong token, TY_EINVAL for a
 * malformed report (details in errs), TY_EPRECONDITION when the report's
 * attempt is not the job's open one (the rank should stop). */
/* Whether a rendezvous request may read or write attempt `attempt` of job
 * id: 0 when token is the job's own and the attempt is the job's current
 * one, still starting or running; TY_EUNAUTHENTICATED (unknown job or
 * another token: the same answer), TY_ENOTFOUND (no such attempt) or
 * TY_EPRECONDITION (the attempt has ended), with msg. */
int svc_rendezvous_check(svc_t *s, const char *id, const char *token, int attempt, char *msg,
                         size_t msgsz);
int svc_report(svc_t *s, const char *id, const char *token, const json_t *report,
               ty_errlist_t *errs, char *msg, size_t msgsz);

/* Events of a job after seq (see db_events_json); *final is true when,
 * before the read, the job was in a final state and every rank process of
 * its last attempt had its end recorded: nothing follows these events. */
int svc_events(svc_t *s, const char *id, int64_t after_seq, int limit, json_t **out,
               int64_t *last_seq, bool *final, char *msg, size_t msgsz);
/* A counter bumped on every new event; svc_wait_events blocks until it
 * differs from seen or timeout_s passes, and returns its value. */
uint64_t svc_event_generation(svc_t *s);
uint64_t svc_wait_events(svc_t *s, uint64_t seen, double timeout_s);

int svc_ranks(svc_t *s, const char *id, int attempt, json_t **out, char *msg, size_t msgsz);
/* The curves of an attempt (the newest when attempt <= 0) over steps
 * [from_step, to_step] (INT64_MAX: to the end), per rank, each thinned to
 * at most max_points (server/thin.h; 0: every point): {"job_id",
 * "attempt", "from_step", "to_step" (null: open), "max_points" (null),
 * "ranks":[{"rank", "points" (in the range, before thinning), "steps",
 * "loss", "tokens_per_s", "t"}]}. The caller checks the range. */
int svc_metrics_range(svc_t *s, const char *id, int attempt, int64_t from_step, int64_t to_step,
                      int64_t max_points, json_t **out, char *msg, size_t msgsz);
/* The path of a rank's log file (a new string). */
int svc_log_path(svc_t *s, const char *id, int attempt, int rank, char **out, char *msg,
                 size_t msgsz);

/* The API view of a job (a new object): id, name, state, reason, attempt,
 * world_size, device, max_restarts, times (RFC 3339, null when unset) and
 * the normalized spec. */
json_t *svc_job_json(const db_job_t *j);

/* svc_job_json with the job's progress, progress_phase, eta_seconds and
 * tokens_per_s (server/progress.h) from its ranks' last reports: the view
 * every API answer gives of a job. */
json_t *svc_job_view(svc_t *s, const db_job_t *j);
/* Fills r's job_* figures: the progress of job id (in state) once report
 * r is taken in, which its "progress" event carries. */
void svc_report_progress(svc_t *s, const char *id, int state, db_report_t *r);

/* Figures for /metrics. */
typedef struct {
  int64_t jobs[DB_JOB_STATE_COUNT];
  int64_t ranks_running;
  int64_t reports_ingested;
  int64_t reports_rejected;
} svc_stats_t;
int svc_stats(svc_t *s, svc_stats_t *out);

/* For the scheduler: THE job state change (db_job_transition) followed by a
 * wake-up of every event waiter. A change the database cannot take now is
 * kept in memory and retried in order until it is written (server/pending.h;
 * 0 is returned, and *cur and *attempt are left unset); a refusal of the
 * change itself (TY_EPRECONDITION, TY_ENOTFOUND) is returned. */
int svc_transition(svc_t *s, const char *id, unsigned from_mask, int to, const char *reason,
                   int *cur, int *attempt);
/* The same, written now or not at all (TY_EUNAVAILABLE while the database
 * takes no writes, or while earlier changes are still kept): for a change
 * that a caller can try again (a client's cancel, a job's start). */
int svc_transition_now(svc_t *s, const char *id, unsigned from_mask, int to, const char *reason,
                       int *cur, int *attempt);
/* True when nothing keeps the server from its work; otherwise false with
 * the causes in why (size bytes): writes kept for retry, jobs that cannot
 * be started, a database file deleted or replaced. Submissions are refused
 * (TY_EUNAVAILABLE) meanwhile. */
bool svc_health(svc_t *s, char *why, size_t size);
/* For the scheduler, every tick: retries kept writes whose backoff is due,
 * and every SVC_FILE_CHECK_S checks that the database file is still the one
 * opened (db_file_check). */
#define SVC_FILE_CHECK_S 1.0
void svc_tick(svc_t *s);
/* For the scheduler: queued jobs cannot be started, because cause (NULL:
 * they can again). */
void svc_start_blocked(svc_t *s, const char *cause);
/* For the scheduler: a rank's process started or finished (with an event);
 * kept and retried as svc_transition's changes are. */
int svc_rank_spawned(svc_t *s, const char *id, int attempt, int rank, int pid,
                     int64_t pid_start, const char *log_path);
int svc_rank_finished(svc_t *s, const char *id, int attempt, int rank, const char *state,
                      int exit_code, const char *message);

#endif
